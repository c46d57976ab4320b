//! The results of a benchmark run: the JSON document, the machine it ran on, and the
//! table of ratios in plain text and in Markdown.

mod machine;
mod markdown;
mod results;
mod row;
mod rows;

pub use machine::Machine;
pub use markdown::results_markdown;
pub use results::Results;
pub use row::{Row, text_table};
pub use rows::rows;
