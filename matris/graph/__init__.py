"""Crystal graphs of MatRIS: atom graph (atoms, bonds) and line graph (bonds, angles)."""

from .batch import GraphBatch, line_graph
from .converter import GraphConverter
from .neighbors import half_neighbor_list
from .radiusgraph import RadiusGraph, datatype
from .system import AtomicSystem, element_symbol

__all__ = ["AtomicSystem", "GraphBatch", "GraphConverter", "RadiusGraph", "datatype", "half_neighbor_list",
           "line_graph", "element_symbol"]
