//! fleet-agent.
