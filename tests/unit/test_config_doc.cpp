// docs/environment.md and the settings table must say the same: every setting has a row
// with its default and meaning, and the doc names no TAIJI_ variable the table lacks.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/settings.h"

using namespace taiji;

namespace {

struct Row {
  std::string def;
  std::string meaning;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(' ');
  const size_t e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Rows "| `TAIJI_X` | field | default | meaning |" of every four-column table.
std::map<std::string, Row> setting_rows(const std::string& doc) {
  std::map<std::string, Row> rows;
  std::istringstream in(doc);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `TAIJI_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream cells_in(line.substr(1));
    for (std::string cell; std::getline(cells_in, cell, '|');) cells.push_back(trim(cell));
    if (cells.size() != 4) continue;
    rows[cells[0].substr(1, cells[0].size() - 2)] = {cells[2], cells[3]};
  }
  return rows;
}

// What the doc shows as a setting's default.
std::string doc_default(const Setting& s) {
  return s.def_doc.empty() ? "`" + std::string(s.def) + "`" : std::string(s.def_doc);
}

// Every way the doc and the table disagree, one line each.
std::vector<std::string> doc_problems(const std::string& doc) {
  std::vector<std::string> problems;
  const std::map<std::string, Row> rows = setting_rows(doc);
  for (const Setting& s : settings()) {
    const std::string name(s.name);
    auto it = rows.find(name);
    if (it == rows.end()) {
      problems.push_back(name + " has no row in the doc");
      continue;
    }
    if (it->second.def != doc_default(s)) {
      problems.push_back(name + ": the doc's default " + it->second.def + " is not " + doc_default(s));
    }
    if (it->second.meaning != s.doc) problems.push_back(name + ": the doc's meaning differs");
  }
  // Named by the doc but not settings: what taiji-run exports for the program's own use,
  // and status codes.
  const std::set<std::string> not_settings = {"TAIJI_LOCAL_RANK", "TAIJI_LOCAL_SIZE"};
  const std::regex mention("`(TAIJI_[A-Z0-9_]+)");
  for (auto m = std::sregex_iterator(doc.begin(), doc.end(), mention); m != std::sregex_iterator();
       ++m) {
    const std::string name = (*m)[1];
    if (find_setting(name) == nullptr && !not_settings.count(name) && name.rfind("TAIJI_ERR_", 0) != 0) {
      problems.push_back("the doc names " + name + ", which is not a setting");
    }
  }
  return problems;
}

std::string read_doc() {
  std::ifstream in(TAIJI_ENVIRONMENT_DOC);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string replaced(std::string doc, const std::string& from, const std::string& to) {
  const size_t at = doc.find(from);
  REQUIRE(at != std::string::npos);
  return doc.replace(at, from.size(), to);
}

bool mentions(const std::vector<std::string>& problems, const std::string& fragment) {
  for (const std::string& p : problems) {
    if (p.find(fragment) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("docs/environment.md has a row for every setting, with its default and meaning",
          "[configdoc]") {
  const std::vector<std::string> problems = doc_problems(read_doc());
  for (const std::string& p : problems) UNSCOPED_INFO(p);
  CHECK(problems.empty());
  CHECK(setting_rows(read_doc()).size() == settings().size());
}

TEST_CASE("the doc check fails on a missing row, a wrong default or meaning, an unknown name",
          "[configdoc]") {
  const std::string doc = read_doc();
  const std::string row_start = "| `TAIJI_CHUNK_BYTES`";
  const size_t row = doc.find(row_start);
  REQUIRE(row != std::string::npos);
  const std::string without_row = doc.substr(0, row) + doc.substr(doc.find('\n', row) + 1);
  CHECK(doc_problems(without_row) == std::vector<std::string>{"TAIJI_CHUNK_BYTES has no row in the doc"});

  CHECK(doc_problems(replaced(doc, "| `1M`         |", "| `2M`         |")) ==
        std::vector<std::string>{"TAIJI_CHUNK_BYTES: the doc's default `2M` is not `1M`"});
  CHECK(doc_problems(replaced(doc, "Pipelining chunk size.", "Chunk size.")) ==
        std::vector<std::string>{"TAIJI_CHUNK_BYTES: the doc's meaning differs"});
  CHECK(doc_problems(doc + "\nSet `TAIJI_CHUNK_SIZE` too.\n") ==
        std::vector<std::string>{"the doc names TAIJI_CHUNK_SIZE, which is not a setting"});
  CHECK(mentions(doc_problems(doc + "| `TAIJI_BOGUS` | — | `1` | A row. |\n"), "TAIJI_BOGUS"));
}
