//! Sans-I/O TCP analyzer: timestamped frames in, per-connection records out (Monkey See)
