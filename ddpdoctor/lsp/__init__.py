"""`ddpdoctor server`: the linter as a Language Server (pygls + lsprotocol, the `server` extra).

`linting` holds the editor-independent part (settings and one warm project view per project,
findings per document); `server` speaks the protocol. Imported only by the `server` command.
"""
