//! Real MCP servers from the package registries (filled below).
