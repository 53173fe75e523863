//! Quota and lifecycle logic on top of the catalog: capacity forecasts, usage scans of POSIX trees, backend
//! reconciliation and the clean-up planner. The catalog (`strata-catalog`) stores; this crate decides, over
//! the catalog and the backends, and knows nothing of HTTP (the agent's control plane calls it).
//!
//! - [`cleanup`]: plan a clean-up from retention policies, run it through a trash, restore, purge; the
//!   safety rules are listed there.
//! - [`reconcile`]: complete parallel listings of a backend, then the inventory and usage made to match.
//! - [`scan`]: a parallel `du`-exact usage walk of a POSIX tree, per owner and per project.
//! - [`forecast`]: when a volume or quota fills, with a prediction interval (OLS, Student-t).

pub mod cleanup;
pub mod forecast;
pub mod reconcile;
pub mod scan;
