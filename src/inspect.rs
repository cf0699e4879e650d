//! Offline inspection (filled in below).
