//! `mimic replay` lab tests (root, namespaces).
