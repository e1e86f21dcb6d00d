"""Layouts: how a host value maps onto a parallel tensor's components.

Uploads: mirrored(), sharded(axis), per_component().
Downloads: component(k), concat(axis), per_component(); mirrored() reads
component 0, which is the value only when the tensor is mirrored.
Source: pd_layout (include/paradev/paradev.h); TensorFlow's parallel device.
"""

from ._lib import lib as _lib

# pd_layout_kind's numbers, from the headers (they are the wire's)
MIRRORED = _lib.PD_LAYOUT_MIRRORED
SHARDED = _lib.PD_LAYOUT_SHARDED
PER_COMPONENT = _lib.PD_LAYOUT_PER_COMPONENT
COMPONENT = _lib.PD_LAYOUT_COMPONENT


class Layout:
    """A pd_layout. download_only: concat(axis) and component(k), which
    name a way to read a tensor, not a way to place a value (upload and
    load refuse them; concat(axis) is sharded(axis)'s wire layout)."""
    __slots__ = ("kind", "axis", "component", "download_only")

    def __init__(self, kind, axis=0, component=0, download_only=False):
        self.kind, self.axis, self.component = kind, int(axis), int(component)
        self.download_only = bool(download_only) or kind == COMPONENT

    def __repr__(self):
        if self.kind == MIRRORED:
            return "paradev.mirrored()"
        if self.kind == SHARDED:
            return "paradev.%s(%d)" % (
                "concat" if self.download_only else "sharded", self.axis)
        if self.kind == PER_COMPONENT:
            return "paradev.per_component()"
        return "paradev.component(%d)" % self.component

    def __eq__(self, other):
        return (isinstance(other, Layout) and self.kind == other.kind and
                self.axis == other.axis and self.component == other.component)

    def __hash__(self):
        return hash((self.kind, self.axis, self.component))


def mirrored():
    """The same value on every device (upload); component 0 (download)."""
    return Layout(MIRRORED)


def sharded(axis=0):
    """Split along `axis` as numpy.array_split does (upload); the download
    counterpart is concat(axis)."""
    return Layout(SHARDED, axis=axis)


def concat(axis=0):
    """Download: every component concatenated along `axis`."""
    return Layout(SHARDED, axis=axis, download_only=True)


def per_component():
    """One host value per component: a list of arrays, both ways."""
    return Layout(PER_COMPONENT)


def component(k):
    """Download: component k alone."""
    return Layout(COMPONENT, component=k)


def check(layout, what):
    if not isinstance(layout, Layout):
        raise TypeError(
            "%s needs a layout: paradev.mirrored(), paradev.sharded(axis), "
            "paradev.per_component(), paradev.component(k) or "
            "paradev.concat(axis); got %r" % (what, layout))
    return layout


def check_placing(layout, what):
    """check(), and refuses the download-only layouts (concat, component)
    where a value is placed onto the devices (upload, load)."""
    check(layout, what)
    if layout.download_only:
        hint = ("paradev.sharded(%d)" % layout.axis
                if layout.kind == SHARDED else "paradev.mirrored()")
        raise ValueError(
            "%s: %r is for downloads; a value is placed with "
            "paradev.mirrored(), paradev.sharded(axis) or "
            "paradev.per_component() (here perhaps %s)"
            % (what, layout, hint))
    return layout
