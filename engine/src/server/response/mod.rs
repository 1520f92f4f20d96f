//! What the server answers: the OpenAI wire types (`protocol`), the bodies and chunks of
//! one request (`writer`), and the collected or streamed answer (`stream`).

pub mod protocol;
pub mod stream;
pub mod writer;

/// The generation route a request came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}
