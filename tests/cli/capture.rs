//! `mimic capture` command-line tests.
