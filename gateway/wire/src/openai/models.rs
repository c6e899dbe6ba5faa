//! `GET /v1/models` and `GET /v1/models/{model}`.

use serde::Serialize;

/// One model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    /// The id clients name.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// When it became available (Unix seconds).
    pub created: u64,
    /// Who publishes it.
    pub owned_by: String,
    /// When it stops being served (`YYYY-MM-DD`), if announced.
    pub shutdown_date: Option<String>,
}

/// The list of models.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The models.
    pub data: Vec<Model>,
}
