//! Placement engine (pure).
