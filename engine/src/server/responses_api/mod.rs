//! `POST /v1/responses`, served as the chat request it describes: `request` reads the body
//! into a chat body (stateless: no stored responses), the chat route's pipeline generates,
//! and `events` turns its stream into the Responses API's events and final response.

pub mod events;
pub mod request;
