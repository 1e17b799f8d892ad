//! Live migration (in progress, see docs/migration.md): the stream a
//! source VMM sends a destination VMM ([`stream`]) and the dirty-page
//! tracking its rounds rely on ([`dirty`]). The sender and the receiver
//! come next.

pub mod dirty;
pub mod stream;
