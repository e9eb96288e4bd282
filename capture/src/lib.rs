//! The capture node: packet sources, flow sampling, anonymization, rotating pcapng output
