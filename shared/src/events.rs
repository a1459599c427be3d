//! Push events (SPEC §5) and how they are derived from the chat table's stream (SPEC §6).
