"""Thin Prefect tasks: one connector call or one core call each.

Tasks that touch the network retry with backoff; core calls never retry (a
retry can't fix arithmetic). No task relies on Prefect's result cache.
"""
