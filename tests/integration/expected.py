"""The settled shapes opencode 1.18.33 itself writes, as the integration suites expect them.

Stated here from the captures (`tests/fixtures/opencode-1.18.33/`), not imported from the
rules, so a wrong rule cannot make its own test pass.
"""

V1_PART_ERROR = "Tool execution aborted"
V2_TOOL_ERROR = {"type": "unknown", "message": "Tool execution interrupted"}
V1_MESSAGE_ERROR = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
