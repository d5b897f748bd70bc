// Read-only Python views of the stats structs. Densities are of elements; dense_fraction is the
// payload's bytes over one dense copy of the same tensors.
#include <pybind11/stl.h>

#include <cstdio>
#include <string>

#include "bindings.h"
#include "refit/offline.h"
#include "refit/receiver.h"
#include "refit/sender.h"

namespace refit::python {

namespace {

double Fraction(uint64_t part, uint64_t whole) {
  return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// The counters every stats struct embeds, as properties of its Python class.
template <typename Class, typename Stats>
void BindCounters(Class& cls) {
  cls.def_property_readonly("changed_elements",
                            [](const Stats& s) { return s.counters.changed_elements; })
      .def_property_readonly("changed_bytes",
                             [](const Stats& s) { return s.counters.changed_bytes; })
      .def_property_readonly("records", [](const Stats& s) { return s.counters.records; });
}

// Only a diff walks the whole model (an apply sees records, not the model).
template <typename Class, typename Stats>
void BindModelCounters(Class& cls) {
  BindCounters<Class, Stats>(cls);
  cls.def_property_readonly(
         "density", [](const Stats& s) { return s.counters.density(); },
         "fraction of the elements whose bits changed")
      .def_property_readonly("total_elements",
                             [](const Stats& s) { return s.counters.total_elements; })
      .def_property_readonly(
          "model_bytes", [](const Stats& s) { return s.counters.model_bytes; },
          "one dense copy of the tensors");
}

std::string SyncRepr(const SyncStats& s) {
  char text[256];
  std::snprintf(text, sizeof(text),
                "SyncStats(version=%llu, full=%s, density=%.6f, payload_bytes=%llu, "
                "seconds=%.3f)",
                static_cast<unsigned long long>(s.version), s.full ? "True" : "False",
                s.counters.density(), static_cast<unsigned long long>(s.payload_bytes),
                s.total_seconds);
  return text;
}

std::string ApplyRepr(const ApplyStats& s) {
  char text[256];
  std::snprintf(text, sizeof(text),
                "ApplyStats(version=%llu, full=%s, changed_elements=%llu, payload_bytes=%llu, "
                "seconds=%.3f)",
                static_cast<unsigned long long>(s.version), s.full ? "True" : "False",
                static_cast<unsigned long long>(s.counters.changed_elements),
                static_cast<unsigned long long>(s.payload_bytes), s.total_seconds);
  return text;
}

void BindSyncStats(py::module_& m) {
  py::class_<SyncStats> cls(m, "SyncStats", "What one Sender.publish did (this rank's part).");
  cls.def_readonly("version", &SyncStats::version)
      .def_readonly("base_version", &SyncStats::base_version, "None for a full sync")
      .def_readonly("full", &SyncStats::full)
      .def_readonly("tensors", &SyncStats::tensors)
      .def_readonly("payload_bytes", &SyncStats::payload_bytes, "bytes that crossed the transport")
      .def_readonly("payloads", &SyncStats::payloads)
      .def_readonly("wait_seconds", &SyncStats::wait_seconds,
                    "waiting for the previous version's acks and the baseline advance")
      .def_readonly("diff_seconds", &SyncStats::diff_seconds)
      .def_readonly("encode_seconds", &SyncStats::encode_seconds, "CPU seconds over all threads")
      .def_readonly("send_seconds", &SyncStats::send_seconds)
      .def_readonly("seconds", &SyncStats::total_seconds, "wall seconds of the publish")
      .def_property_readonly(
          "dense_fraction",
          [](const SyncStats& s) { return Fraction(s.payload_bytes, s.counters.model_bytes); },
          "payload_bytes / one dense copy of the published tensors")
      .def("__repr__", &SyncRepr);
  BindModelCounters<decltype(cls), SyncStats>(cls);
}

void BindApplyStats(py::module_& m) {
  py::class_<ApplyStats> cls(m, "ApplyStats", "What one Receiver.poll or refit.apply applied.");
  cls.def_readonly("version", &ApplyStats::version)
      .def_readonly("full", &ApplyStats::full)
      .def_readonly("payloads", &ApplyStats::payloads)
      .def_readonly("payload_bytes", &ApplyStats::payload_bytes)
      .def_readonly("resumed", &ApplyStats::resumed, "an interrupted apply was resumed")
      .def_readonly("fetch_seconds", &ApplyStats::fetch_seconds)
      .def_readonly("apply_seconds", &ApplyStats::apply_seconds,
                    "decode + apply + digest verification")
      .def_readonly("seconds", &ApplyStats::total_seconds, "wall seconds of the apply")
      .def("__repr__", &ApplyRepr);
  BindCounters<decltype(cls), ApplyStats>(cls);
}

}  // namespace

void BindStats(py::module_& m) {
  BindSyncStats(m);
  BindApplyStats(m);
  py::class_<DiffStats> diff(m, "DiffStats", "What refit.diff wrote.");
  diff.def_readonly("tensors", &DiffStats::tensors)
      .def_readonly("delta_bytes", &DiffStats::delta_bytes, "the delta file's size")
      .def_property_readonly(
          "dense_fraction",
          [](const DiffStats& s) { return Fraction(s.delta_bytes, s.counters.model_bytes); },
          "delta_bytes / one dense copy of the new checkpoint's tensors");
  BindModelCounters<decltype(diff), DiffStats>(diff);
  py::class_<Ack>(m, "Ack", "A receiver's acknowledgement of a version.")
      .def_readonly("receiver", &Ack::receiver)
      .def_readonly("version", &Ack::version)
      .def_readonly("apply_seconds", &Ack::apply_seconds)
      .def_readonly("applied_records", &Ack::applied_records)
      .def_readonly("commit_sha256", &Ack::commit_sha256)
      .def("__repr__", [](const Ack& a) {
        return "Ack(receiver='" + a.receiver + "', version=" + std::to_string(a.version) + ")";
      });
}

}  // namespace refit::python
