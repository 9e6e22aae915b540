"""Plain-Python state of the chat window (no Qt): the open conversation, the streaming reply.

``session`` (:class:`~app.state.session.ChatSession`: turns over the store),
``reply`` (:class:`~app.state.reply.ReplyState`: one reply folded from engine
events, and the line of numbers under it), ``answer_seed`` (earlier answers
for the engine's answer memory) and ``model_facts`` (the loaded model's facts
as a person reads them).  Widgets read this state; nothing here imports Qt.
"""
