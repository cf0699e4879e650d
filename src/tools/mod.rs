//! Tools built on the store's formats and public API: `inspect` (an independent
//! reader of store files, the oracle the tests check the store against) and `loadgen`
//! (the load generator behind `coremq bench`).

pub mod inspect;
pub mod loadgen;
