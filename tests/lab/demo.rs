//! `mimic demo` lab tests (root, namespaces).
