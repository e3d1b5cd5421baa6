//! slurm-sys
