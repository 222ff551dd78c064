"""Front-ends of the chat runtime (runtime/core.py): each turns one transport's messages into
`InboundMessage`s and gives the core an `Outbox`.

- `terminal`: `gieok chat`, one local user talking to the bot in a terminal.
- `discord_bot`: the Discord bot (needs the `discord` extra).

Nothing is imported here, so using one adapter never imports another's dependencies
(discord.py is optional).
"""

__all__: list[str] = []
