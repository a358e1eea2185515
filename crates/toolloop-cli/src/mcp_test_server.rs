//! The MCP test server (see `toolloop_mcp::test_server`), built with the `test-hooks` feature
//! for the command's tests.

fn main() {
    toolloop_mcp::test_server::main();
}
