#pragma once
// A validator of Chrome trace-event files as hyflow's step timeline writes them (docs/profiling.md):
// shared by the timeline tests of the in-process trainer and of the trainer on caf-nodes.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace trace_test {
using Json = nlohmann::json;
namespace fs = std::filesystem;

inline constexpr double kEps = 0.01;  // µs: the writer's rounding

struct Span {
  std::string name, cat;
  double ts, dur;
  double end() const { return ts + dur; }
  bool contains(const Span& o) const { return ts <= o.ts + kEps && o.end() <= end() + kEps; }
};

/// The timeline as the validator reads it: the process and thread names, and the spans by track.
struct Timeline {
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  std::map<std::string, std::vector<Span>> tracks;  // by thread name
};

/// Checks the trace-event format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU)
/// as this writer uses it: X spans and M metadata, every span on a named process and thread.
inline Timeline validate_format(const Json& doc) {
  REQUIRE(doc.is_object());
  REQUIRE(doc.contains("traceEvents"));
  REQUIRE(doc.at("traceEvents").is_array());
  REQUIRE(!doc.at("traceEvents").empty());
  Timeline t;
  std::vector<std::tuple<int, int, Span>> spans;
  for (const auto& e : doc.at("traceEvents")) {
    INFO(e.dump());
    REQUIRE(e.is_object());
    for (const char* k : {"name", "ph"}) REQUIRE((e.contains(k) && e.at(k).is_string()));
    for (const char* k : {"pid", "tid"}) REQUIRE((e.contains(k) && e.at(k).is_number_integer()));
    REQUIRE((e.contains("ts") && e.at("ts").is_number()));
    const std::string ph = e.at("ph"), name = e.at("name");
    const int pid = e.at("pid"), tid = e.at("tid");
    if (ph == "M") {
      REQUIRE((e.contains("args") && e.at("args").is_object()));
      const Json& a = e.at("args");
      if (name == "process_name" || name == "thread_name") {
        REQUIRE((a.contains("name") && a.at("name").is_string() && !a.at("name").get<std::string>().empty()));
        if (name == "process_name")
          REQUIRE(t.processes.emplace(pid, a.at("name")).second);
        else
          REQUIRE(t.threads.emplace(std::pair(pid, tid), a.at("name")).second);
      } else {
        REQUIRE((name == "process_sort_index" || name == "thread_sort_index"));
        REQUIRE((a.contains("sort_index") && a.at("sort_index").is_number_integer()));
      }
      continue;
    }
    REQUIRE(ph == "X");
    REQUIRE((e.contains("dur") && e.at("dur").is_number()));
    REQUIRE(e.at("dur").get<double>() >= 0);
    REQUIRE(e.at("ts").get<double>() >= 0);
    REQUIRE((e.contains("cat") && e.at("cat").is_string()));
    spans.emplace_back(pid, tid, Span{name, e.at("cat"), e.at("ts"), e.at("dur")});
  }
  for (auto& [pid, tid, span] : spans) {
    INFO("span " << span.name << " on pid " << pid << " tid " << tid);
    REQUIRE(t.processes.count(pid));
    REQUIRE(t.threads.count({pid, tid}));
    t.tracks[t.threads.at({pid, tid})].push_back(std::move(span));
  }
  for (auto& [name, list] : t.tracks)
    std::sort(list.begin(), list.end(), [](const Span& a, const Span& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;  // a parent before the child it starts with
    });
  return t;
}

/// On one track, spans are nested or disjoint, never partially overlapping.
inline void require_nested(const std::string& track, const std::vector<Span>& spans) {
  std::vector<const Span*> open;
  for (const auto& s : spans) {
    while (!open.empty() && open.back()->end() <= s.ts + kEps) open.pop_back();
    if (!open.empty()) {
      INFO("track '" << track << "': '" << s.name << "' [" << s.ts << ", " << s.end() << "] partially overlaps '"
                     << open.back()->name << "' [" << open.back()->ts << ", " << open.back()->end() << "]");
      REQUIRE(open.back()->contains(s));
    }
    open.push_back(&s);
  }
}

inline const Span* innermost(const std::vector<Span>& spans, const Span& s, const std::string& cat) {
  const Span* best = nullptr;
  for (const auto& p : spans)
    if (&p != &s && p.cat == cat && p.contains(s) && (!best || best->contains(p))) best = &p;
  return best;
}

inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

inline Json read_json(const fs::path& file) {
  std::ifstream in(file);
  REQUIRE(in.good());
  return Json::parse(in);
}

}  // namespace trace_test
