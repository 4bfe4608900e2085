// Command lines for the tools, through CLI11: one way to read integers and numbers, one way to
// report a usage error (the tool's name, one line, exit status 2), --help on every tool.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kiln::tooling {

// A bad command line found after CLI11 has parsed it (a missing positional, options that do
// not go together): reported like CLI11's own errors.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `text` as a decimal integer in [min, max]: digits with an optional leading '-', nothing
// else (no spaces, no '+', no hex or octal prefix, no fraction); out of range is an error, not
// a wrap-around. Throws UsageError naming `what`.
template <std::integral T>
T parse_int(const std::string& what, const std::string& text, T min,
            T max = std::numeric_limits<T>::max()) {
  const std::string expected =
      what + " needs an integer >= " + std::to_string(min) +
      (max == std::numeric_limits<T>::max() ? "" : " and <= " + std::to_string(max));
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    throw UsageError(expected + ", got '" + text + "'");
  }
  if (ec == std::errc::result_out_of_range) {
    throw UsageError(expected + ", got '" + text + "' (out of range)");
  }
  if (value < min || value > max) throw UsageError(expected + ", got '" + text + "'");
  return value;
}

// `text` as comma-separated integers (parse_int each); an empty list is an error.
template <std::integral T>
std::vector<T> parse_int_list(const std::string& what, const std::string& text, T min) {
  std::vector<T> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(parse_int<T>(what, item, min));
  if (out.empty()) throw UsageError(what + " is empty");
  return out;
}

// `text` as a finite decimal number >= min (same rules as parse_int; exponents allowed).
inline double parse_number(const std::string& what, const std::string& text, double min) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) || value < min) {
    std::ostringstream bound;
    bound << min;
    throw UsageError(what + " needs a number >= " + bound.str() + ", got '" + text + "'");
  }
  return value;
}

// --name N into `target`, read with parse_int.
template <std::integral T>
CLI::Option* add_int(CLI::App& app, const std::string& name, T& target, T min,
                     const std::string& help, T max = std::numeric_limits<T>::max()) {
  return app
      .add_option_function<std::string>(
          name,
          [&target, name, min, max](const std::string& v) {
            target = parse_int<T>(name, v, min, max);
          },
          help)
      ->type_name("N");
}

// --name X into `target`, read with parse_number.
template <std::floating_point T>
CLI::Option* add_number(CLI::App& app, const std::string& name, T& target, double min,
                        const std::string& help) {
  return app
      .add_option_function<std::string>(
          name,
          [&target, name, min](const std::string& v) {
            target = static_cast<T>(parse_number(name, v, min));
          },
          help)
      ->type_name("X");
}

// --name VALUE where VALUE is one of `choices`; `parse` maps it (nullopt: not a choice).
template <typename T, typename Parse>
CLI::Option* add_choice(CLI::App& app, const std::string& name, T& target, Parse parse,
                        const std::string& choices, const std::string& help) {
  return app
      .add_option_function<std::string>(
          name,
          [&target, name, parse, choices](const std::string& v) {
            const std::optional<T> parsed = parse(v);
            if (!parsed) throw UsageError(name + " takes " + choices + ", got '" + v + "'");
            target = *parsed;
          },
          help)
      ->type_name("NAME");
}

// A repeatable --name NAME=FILE, one pair per occurrence.
inline CLI::Option* add_named_files(CLI::App& app, const std::string& name,
                                    std::vector<std::pair<std::string, std::string>>& target,
                                    const std::string& form, const std::string& help) {
  return app
      .add_option_function<std::vector<std::string>>(
          name,
          [&target, name, form](const std::vector<std::string>& specs) {
            for (const std::string& v : specs) {
              const size_t eq = v.find('=');
              if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
                throw UsageError(name + " needs " + form + ", got '" + v + "'");
              target.emplace_back(v.substr(0, eq), v.substr(eq + 1));
            }
          },
          help)
      ->type_name(form)
      ->allow_extra_args(false)
      ->take_all();
}

// A repeatable --name VALUE, one value per occurrence.
inline CLI::Option* add_repeated(CLI::App& app, const std::string& name,
                                 std::vector<std::string>& target, const std::string& help) {
  return app.add_option(name, target, help)->allow_extra_args(false)->take_all();
}

// Sets up `app` the way every tool wants it: arguments CLI11 does not know are collected
// (and reported by parse_command_line as "unknown option" / "unexpected argument").
inline void configure(CLI::App& app) {
  app.allow_extras(true);
  // A repeated option: the last one counts (a script may append to a default command line).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "print this help and exit");
}

// A usage error found after parsing, reported like a bad command line; returns 2.
inline int usage_error(const CLI::App& app, const std::string& what) {
  std::cerr << app.get_name() << ": " << what << "\n"
            << "run '" << app.get_name() << " --help' for the options\n";
  return 2;
}

// Parses argv into `app`. nullopt: go on; otherwise the status to exit with: 0 after --help
// (printed on stdout), 2 after a usage error (one line "TOOL: what is wrong" on stderr and a
// pointer to --help).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e.what());
  } catch (const UsageError& e) {
    return usage_error(app, e.what());
  }
  const std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) {
    const std::string& a = extras.front();
    return usage_error(app, a.size() > 1 && a[0] == '-' ? "unknown option '" + a + "'"
                                                        : "unexpected argument '" + a + "'");
  }
  return std::nullopt;
}

}  // namespace kiln::tooling
