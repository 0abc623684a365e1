"""Agent framework adapters: every model request and tool call of an agent run through the action ledger.

Each adapter is an optional extra and imports its framework only when imported:

- :mod:`leaseq.integrations.pydantic_ai` (``pip install 'leaseq[pydantic-ai]'``):
  :class:`~leaseq.integrations.pydantic_ai.LeaseqModel` and
  :class:`~leaseq.integrations.pydantic_ai.LeaseqToolset`;
- :mod:`leaseq.integrations.openai_agents` (``leaseq[openai-agents]``):
  :class:`~leaseq.integrations.openai_agents.LeaseqModel` and
  :func:`~leaseq.integrations.openai_agents.ledgered_tools`;
- :mod:`leaseq.integrations.langgraph` (``leaseq[langgraph]``):
  :func:`~leaseq.integrations.langgraph.model_node` and
  :class:`~leaseq.integrations.langgraph.LeaseqToolNode`.

Model requests are ``read_only`` calls keyed by their position; tool calls are
keyed by the framework's tool-call id, which is stable across attempts
because the model response that named it is itself replayed. A tool's
class comes from ``effects={name: "read_only" | "idempotent" | "side_effect"}``
and defaults to ``side_effect``: an unlisted tool is never repeated blindly.
"""
