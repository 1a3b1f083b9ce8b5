"""Griffe extensions for the API pages: every attribute shows its type and its own description.

* ``InstanceAttributeValues``: griffe records an attribute assigned in ``__init__``
  (``self.seed = seed``) with the assigned expression as its value, and the page would show
  ``seed = seed`` — the constructor's code, not the attribute's meaning. The value is dropped (the
  annotation, when there is one, stays).
* ``AttributeDescriptions``: classes document their fields in an ``Attributes:`` section of the
  class docstring; each field's entry on the page would stay empty. The section's description is
  copied onto every field that has no docstring of its own (the site hides the section's table:
  ``show_docstring_attributes: false``), so each counter, field and attribute reads on its own.
"""

from __future__ import annotations

from typing import Any

from griffe import Attribute, Class, Docstring, DocstringSectionAttributes, Extension, Object

__all__ = ["AttributeDescriptions", "InstanceAttributeValues"]


class InstanceAttributeValues(Extension):
    """Forget the expression of every instance attribute assigned in a method (``__init__``)."""

    def on_attribute_instance(self, *, attr: Attribute, **kwargs: Any) -> None:
        if "instance-attribute" in attr.labels and _assigned_in_a_method(attr):
            attr.value = None


def _assigned_in_a_method(attr: Attribute) -> bool:
    """Whether the assignment sits inside one of the class's methods (not a dataclass field)."""
    cls = attr.parent
    if cls is None or not cls.is_class or attr.lineno is None:
        return False
    for member in cls.members.values():
        if member.is_function and member.lineno is not None and member.endlineno is not None:
            if member.lineno <= attr.lineno <= member.endlineno:
                return True
    return False


class AttributeDescriptions(Extension):
    """Give each attribute the description its class's ``Attributes:`` section holds for it."""

    def on_class_members(self, *, cls: Class, **kwargs: Any) -> None:
        _copy_descriptions(cls)

    def on_module_members(self, *, mod: Object, **kwargs: Any) -> None:
        _copy_descriptions(mod)


def _copy_descriptions(owner: Object) -> None:
    if owner.docstring is None:
        return
    for section in owner.docstring.parse("google"):
        if not isinstance(section, DocstringSectionAttributes):
            continue
        for entry in section.value:
            member = owner.members.get(entry.name)
            if member is not None and not member.is_alias and member.docstring is None and entry.description:
                member.docstring = Docstring(entry.description, parent=member)
