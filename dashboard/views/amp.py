"""Technique page: amp (time, memory and floor tables, with the spread of every sample)."""

from _technique import technique_page

technique_page("amp")
