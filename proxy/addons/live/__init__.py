"""The live feature: everything the proxy says on client event streams.

Three addons share it: `live-settle` (`addon`: tells `/global/event`, `/event` and 2.x's
`/api/event` what the server would have said had it settled a call itself, with its parts:
`memory`, `stored`, `parts`, `turns`, `calls`, `held`, `clients`, `replay`, `catch_up`,
`notices`, `default_directory`), `session-stream-settle` (`session_streams`: a 1.18 v2 session's
own stream) and `resume-clients` (`resume_clients`: the clients a resume waits for). What they
share: `confirmations` (the confirmer: each confirmation, `parts`, `calls`, `turns` and the
session stream's, is a kind of it), `after_grace` (the reading a confirmation takes) and `held`.
"""
