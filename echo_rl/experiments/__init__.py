"""Experiments: programs that run studies over the library, one module each (``python -m
echo_rl.experiments.<name>``). They use the library's public parts; nothing in the library imports them.

``lm_study`` — GRPO vs ECHO vs ECHO + latent plan on a text task, several seeds, with a summary.
"""
