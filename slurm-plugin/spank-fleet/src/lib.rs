//! spank-fleet
