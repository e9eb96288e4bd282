//! `mimic replay` command-line tests.
