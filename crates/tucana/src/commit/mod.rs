//! commit
