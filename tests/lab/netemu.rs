//! `mimic netemu` lab tests (root, namespaces).
