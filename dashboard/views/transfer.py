"""Technique page: transfer (time, memory and floor tables, with the spread of every sample), and
the host-gather roofline in a tab of its own."""

from _roofline import roofline_tab
from _technique import OwnTab, technique_page

from speedbench.report import roofline

technique_page("transfer", OwnTab("Roofline", roofline.is_roofline, roofline_tab))
