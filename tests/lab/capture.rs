//! `mimic capture` lab tests (root, namespaces).
