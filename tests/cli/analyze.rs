//! `mimic analyze` command-line tests.
