//! Quota and lifecycle logic on top of the catalog: capacity forecasts, usage scans of POSIX trees, backend
//! reconciliation and the clean-up planner.

pub mod cleanup;
pub mod forecast;
pub mod reconcile;
pub mod scan;
