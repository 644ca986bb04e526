"""Constrained decoding: constraint compile and cache, token FSM, jump-forward, bitmasks."""

from grammar.compiler import CompilerConfig, GrammarCompiler, GrammarError
from grammar.constraint import Constraint, constraint_from_params, plan
from grammar.jump_forward import Retokenizer
from grammar.matcher import CompiledGrammar, GrammarMatcher
from grammar.vocabulary import TokenVocabulary

__all__ = ["CompiledGrammar", "CompilerConfig", "Constraint", "GrammarCompiler", "GrammarError", "GrammarMatcher",
           "Retokenizer", "TokenVocabulary", "constraint_from_params", "plan"]
