//! fleet-metasched.
