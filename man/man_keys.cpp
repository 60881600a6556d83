// Build-time helper for hp-recipe(5): the key reference of that page is generated from the key tables
// of hp/recipe/schema_doc.h (checked against the recipe and cluster writers by schema_doc_test), so
// the page cannot list a key the parsers do not know nor miss one they accept.
//
//   hp_man_keys TEMPLATE OUT   copies TEMPLATE to OUT with the lines @RECIPE_KEYS@ and @CLUSTER_KEYS@
//                              replaced by one Markdown subsection per table section
//   hp_man_keys --list         prints "section<TAB>key" for every documented key (coverage test)
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include "hp/core/fs.h"
#include "hp/recipe/schema_doc.h"

namespace {

using hp::recipe::KeyDoc;

// Backslash-escapes the characters Markdown would read as markup ("dp*tp*pp", "[[stages]]",
// "<tensor>"), so the table text reaches the page verbatim.
std::string md_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\`*_[]<>|#").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// "yes" -> "required"; "no (1f1b)" -> "default: 1f1b"; anything else ("yes except outermost")
// is already a sentence.
std::string requirement(std::string_view r) {
  if (r == "yes") return "required";
  if (r.rfind("no (", 0) == 0 && r.back() == ')') return "default: " + std::string(r.substr(4, r.size() - 5));
  return std::string(r);
}

// One "## [section]" subsection per run of keys of the same section, each key a definition list entry.
std::string render(std::span<const KeyDoc> keys) {
  std::ostringstream out;
  std::string_view section;
  for (const auto& k : keys) {
    if (k.section != section) {
      section = k.section;
      out << "## " << md_escape(section) << "\n\n";
    }
    out << "**" << md_escape(k.key) << "** (" << md_escape(k.type) << "; " << md_escape(requirement(k.required))
        << ")\n:   " << md_escape(k.meaning) << "\n\n";
  }
  return out.str();
}

int fill(const char* in_path, const char* out_path) {
  std::ifstream in(in_path);
  if (!in) {
    std::cerr << "hp_man_keys: cannot read " << in_path << "\n";
    return 3;
  }
  std::ostringstream out;
  int markers = 0;
  for (std::string line; std::getline(in, line);) {
    if (line == "@RECIPE_KEYS@") {
      out << render(hp::recipe::recipe_keys());
      ++markers;
    } else if (line == "@CLUSTER_KEYS@") {
      out << render(hp::recipe::cluster_keys());
      ++markers;
    } else {
      out << line << "\n";
    }
  }
  if (markers != 2) {
    std::cerr << "hp_man_keys: " << in_path << " must hold the lines @RECIPE_KEYS@ and @CLUSTER_KEYS@ once each\n";
    return 3;
  }
  if (auto st = hp::write_file_atomic(out_path, out.str()); !st.ok()) {
    std::cerr << "hp_man_keys: " << st.error().str() << "\n";
    return 5;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--list") {
    for (auto table : {hp::recipe::recipe_keys(), hp::recipe::cluster_keys()})
      for (const auto& k : table) std::cout << k.section << '\t' << k.key << '\n';
    return 0;
  }
  if (argc == 3) return fill(argv[1], argv[2]);
  std::cerr << "usage: hp_man_keys TEMPLATE OUT | hp_man_keys --list\n";
  return 2;
}
