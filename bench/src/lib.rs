//! Shared nothing: each benchmark is a binary under `src/bin`.
