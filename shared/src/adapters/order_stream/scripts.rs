//! The Lua scripts of the orders streams, loaded once per process. The stream scripts
//! carry `lua/lib/streams.lua` (the helpers they share) in front of their own text.

use std::sync::LazyLock;

use redis::Script;

/// A stream script with `lua/lib/streams.lua` (helpers it shares) in front of it.
macro_rules! stream_script {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("../../../../lua/lib/streams.lua"),
            include_str!(concat!("../../../../lua/", $name, ".lua"))
        ))
    };
}

pub(super) static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/dead_letter.lua")));
pub(super) static TRIM: LazyLock<Script> = LazyLock::new(|| stream_script!("trim"));
pub(super) static PROBE: LazyLock<Script> = LazyLock::new(|| stream_script!("probe"));
pub(super) static READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/read.lua")));
pub(super) static EXPIRE_SALE: LazyLock<Script> = LazyLock::new(|| stream_script!("expire_sale"));
pub(super) static REPLAY_DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| stream_script!("replay_dead_letter"));
