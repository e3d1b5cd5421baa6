//! slurm.conf-grammar parser (nom).
