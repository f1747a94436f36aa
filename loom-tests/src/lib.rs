//! Loom model checks for kvslots.
