// refit.Config: a parsed TOML config, from a file or a string, with programmatic overrides.
#include "refit/config.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"

namespace refit::python {

namespace {

// Python values -> the config's own types; bool before int (bool is an int in Python).
void SetValue(Config& config, const std::string& key, const py::handle& value) {
  ConfigValue v;
  if (py::isinstance<py::bool_>(value)) {
    v.type = REFIT_CFG_BOOL;
    v.bool_value = value.cast<bool>();
  } else if (py::isinstance<py::int_>(value)) {
    v.type = REFIT_CFG_INT;
    v.int_value = value.cast<int64_t>();
  } else if (py::isinstance<py::float_>(value)) {
    v.type = REFIT_CFG_DOUBLE;
    v.double_value = value.cast<double>();
  } else if (py::isinstance<py::str>(value)) {
    v.type = REFIT_CFG_STRING;
    v.string_value = value.cast<std::string>();
  } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    v.type = REFIT_CFG_STRING_LIST;
    v.list_value = value.cast<std::vector<std::string>>();
  } else {
    Check(Status::Invalid("config key '" + key + "': a " +
                          py::str(value.get_type().attr("__name__")).cast<std::string>() +
                          " is not a config value (bool, int, float, str or list of str)"),
          Stage::kConfig);
  }
  config.Set(key, std::move(v));
}

py::object GetValue(const Config& config, const std::string& key) {
  const ConfigValue* v = config.Find(key);
  if (v == nullptr) return py::none();
  switch (v->type) {
    case REFIT_CFG_BOOL:
      return py::bool_(v->bool_value);
    case REFIT_CFG_INT:
      return py::int_(v->int_value);
    case REFIT_CFG_DOUBLE:
      return py::float_(v->double_value);
    case REFIT_CFG_STRING_LIST:
      return py::cast(v->list_value);
    default:
      return py::str(v->string_value);
  }
}

}  // namespace

void BindConfig(py::module_& m) {
  py::class_<Config>(m, "Config", "A refit TOML config (docs/config.md has every key).")
      .def_static(
          "from_file",
          [](const std::string& path) { return Unwrap(Config::FromFile(path), Stage::kConfig); },
          py::arg("path"), "Parses a TOML file; errors name file:line and key.")
      .def_static(
          "from_string",
          [](const std::string& text, const std::string& label) {
            return Unwrap(Config::FromString(text, label), Stage::kConfig);
          },
          py::arg("text"), py::arg("label") = "<string>",
          "Parses TOML text; `label` stands for the file name in messages.")
      .def("set", &SetValue, py::arg("key"), py::arg("value"),
           "Overrides a dotted key (e.g. 'sender.state_dir') with a bool, int, float, str or "
           "list of str.")
      .def("get", &GetValue, py::arg("key"), "The value of a dotted key, or None if unset.")
      .def("keys",
           [](const Config& c) {
             std::vector<std::string> keys;
             for (const auto& [key, value] : c.values()) keys.push_back(key);
             return keys;
           })
      .def_property_readonly("label", &Config::label)
      .def("__contains__", &Config::Has)
      .def("__repr__", [](const Config& c) { return "refit.Config('" + c.label() + "')"; });
}

}  // namespace refit::python
