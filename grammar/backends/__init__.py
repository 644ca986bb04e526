"""Grammar backends behind one matcher interface: outlines (the default), xgrammar, llguidance.

A compiled grammar (`CompiledGrammar`, `XgrammarGrammar`, `LlguidanceGrammar`) is shared by
every request with the same constraint; `.matcher(budget_aware)` gives one request's walk
through it, with:

  fill_bitmask(out, remaining)  the allowed tokens (int32 bitset row; EOS where it may end)
  accept_token(t) / accept_tokens(ts)  advance (all or none); False leaves it unchanged
  rollback(n)                   undo the last n accepted tokens
  allows_end() / is_terminated()  may end here / nothing but EOS may follow
  forced_bytes()                the text every continuation starts with (jump-forward)
  distance() / closing(remaining) / budget_aware  budget-aware closing (outlines only)

grammar/compiler.py picks the backend per constraint (`constraint.backend_for`).
"""
