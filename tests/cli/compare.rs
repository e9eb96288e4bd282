//! `mimic compare` command-line tests.
