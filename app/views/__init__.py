"""Widgets that show state and emit user intent as signals; none of them calls the engine.

``chat_view`` (the conversation pane) with ``message_widget`` (one bubble)
and ``markdown_render`` (Markdown to safe Qt rich text), ``composer`` (the
message box), ``sidebar`` with ``conversation_list`` (its item model),
``status_area`` (the status bar), ``banner`` (a message strip) and ``style``
(the stylesheet and colours).
"""
