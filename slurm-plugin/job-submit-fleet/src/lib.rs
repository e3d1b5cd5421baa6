//! job-submit-fleet
