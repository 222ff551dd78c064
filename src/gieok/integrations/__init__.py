"""gieok inside the agent frameworks people use, each through the extension point the framework
documents as its own — no monkey-patching. Every adapter talks to `gieok serve` through
`gieok.client` and imports only its own framework, installed with its extra:

- `gieok.integrations.openai_agents` (`pip install "gieok[openai-agents]"`): a `Session`
  (`GieokSession`) and the context as the agent's instructions (`GieokInstructions`);
- `gieok.integrations.langgraph` (`pip install "gieok[langgraph]"`): a `BaseStore` for long-term
  memory and a chat-message history;
- `gieok.integrations.llamaindex` (`pip install "gieok[llamaindex]"`): a memory block
  (`GieokMemoryBlock`) and a token counter that needs no downloaded vocabulary.

docs/integrations/ has a page for each.
"""

__all__: list[str] = []  # each adapter is imported from its own module (its framework is an extra)
