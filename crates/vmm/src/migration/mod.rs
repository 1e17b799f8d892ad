//! Live migration (docs/migration.md): the dirty-page tracking its rounds
//! rely on ([`dirty`]), the source's side ([`send`]: pre-copy rounds, then
//! the guest stopped for the rest) and the destination's ([`receive`]:
//! `domus run --incoming`). The stream between them is
//! `domus_api::migration`.

pub mod dirty;
pub mod receive;
pub mod send;
