//! What the store's self-check (`store/self_check.rs`) reads of the key index: its
//! directory and the files it holds, oldest first. Reads only.

use super::IndexService;
use std::path::PathBuf;

impl IndexService {
    /// The index directory and the names of the files held, oldest first.
    pub fn layout(&self) -> (PathBuf, Vec<String>) {
        let names = self.files.borrow().iter().map(|f| f.name.clone()).collect();
        (self.dir.clone(), names)
    }
}
