//! slurm
