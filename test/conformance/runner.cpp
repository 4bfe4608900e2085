// kiln-conformance: runs the official ONNX backend test cases and compares with their
// expected outputs using onnxruntime's tolerances (rtol 1e-3, atol 1e-5 unless a case says
// otherwise).
//
//   kiln-conformance [--data DIR] [--filter TEXT] [--report FILE] [--write-allowlist FILE]
//                    [--check-allowlist FILE] [--jobs N] [--timeout SECONDS] [-v]
//
// Each case runs in a forked child so that a crash or hang is reported as such instead of
// ending the run. With --check-allowlist only the listed cases run, and the exit status is 1
// if any of them does not pass. Without test data it prints why and exits with 77 (CTest's
// "skipped").
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/util/json_file.h"
#include "kiln/kiln.h"
#include "proto/loader.h"
#include "tools/common/cli.h"
#include "tools/common/compare.h"
#include "tools/common/test_data.h"

namespace fs = std::filesystem;

namespace {

constexpr int kSkipped = 77;
const char* const kFolders[] = {"node",  "simple", "pytorch-converted", "pytorch-operator",
                                "light", "real"};

struct Case {
  std::string id;                      // "node/test_add"
  std::string folder;                  // "node"
  std::string model;                   // path to the .onnx file
  std::vector<std::string> data_sets;  // test_data_set_N folders
  std::string light_output;            // light/ layout: expected output file, inputs are zeros
  double rtol = 1e-3, atol = 1e-5;
};

struct Result {
  std::string status;  // pass, fail, unsupported, error, crash, timeout
  std::string reason;
};

std::vector<Case> discover(const fs::path& root) {
  std::vector<Case> cases;
  for (const char* folder : kFolders) {
    const fs::path dir = root / folder;
    if (!fs::is_directory(dir)) continue;
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(dir)) entries.push_back(e.path());
    std::sort(entries.begin(), entries.end());
    for (const fs::path& p : entries) {
      Case c;
      c.folder = folder;
      if (std::string(folder) == "light") {
        if (p.extension() != ".onnx") continue;
        c.id = std::string(folder) + "/" + p.stem().string();
        c.model = p.string();
        c.light_output = (dir / (p.stem().string() + "_output_0.pb")).string();
        cases.push_back(c);
        continue;
      }
      if (!fs::is_directory(p)) continue;
      c.id = std::string(folder) + "/" + p.filename().string();
      if (std::string(folder) == "real") {
        // data.json names a model; the ones in this data set point at light/ copies. A file
        // that cannot be read is reported and its case left out.
        const std::string data_file = (p / "data.json").string();
        std::string url;
        try {
          const kiln::json::Json data = kiln::json::read_file(data_file);
          url = data.value("url", "");
          c.rtol = data.value("rtol", c.rtol);
          c.atol = data.value("atol", c.atol);
        } catch (const kiln::Error& e) {  // names the file
          std::cerr << "kiln-conformance: " << e.what() << " (skipped)\n";
          continue;
        } catch (const std::exception& e) {  // a value of the wrong type
          std::cerr << "kiln-conformance: " << data_file << ": " << e.what() << " (skipped)\n";
          continue;
        }
        const size_t at = url.find("light/");
        if (at == std::string::npos) continue;
        const fs::path model = root / url.substr(at);
        c.model = model.string();
        c.light_output = (model.parent_path() / (model.stem().string() + "_output_0.pb")).string();
        cases.push_back(c);
        continue;
      }
      c.model = (p / "model.onnx").string();
      if (!fs::exists(c.model)) continue;
      std::vector<fs::path> sets;
      for (const auto& e : fs::directory_iterator(p)) {
        if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) {
          sets.push_back(e.path());
        }
      }
      std::sort(sets.begin(), sets.end());
      for (const auto& s : sets) c.data_sets.push_back(s.string());
      cases.push_back(c);
    }
  }
  return cases;
}

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t' || c == '|') c = ' ';
  }
  if (s.size() > 300) s = s.substr(0, 297) + "...";
  return s;
}

Result run_case(const Case& c) {
  try {
    kiln::SessionOptions so;
    so.environment = std::make_shared<kiln::Environment>(1);
    kiln::Session session(c.model, so);
    if (!c.light_output.empty()) {
      // Light models: every input without a default is fed zeros (symbolic dims as 1).
      std::vector<kiln::NamedValue> inputs;
      const auto& ins = session.inputs();
      for (const auto& io : ins) {
        if (io.has_default) continue;
        kiln::Shape shape;
        for (int64_t d : io.shape) shape.push_back(d < 0 ? 1 : d);
        inputs.push_back({io.name, kiln::Tensor::zeros(io.dtype, shape)});
      }
      auto outputs = session.run(std::move(inputs));
      kiln::ir::TypeInfo t;
      t.kind = kiln::Value::Kind::Tensor;
      kiln::Value expected = kiln::proto::read_value_file(c.light_output, t, nullptr);
      auto cmp = kiln::tooling::compare_values(outputs.at(0).value, expected, c.rtol, c.atol);
      if (!cmp.ok) return {"fail", "output 0: " + cmp.message};
      return {"pass", ""};
    }
    if (c.data_sets.empty()) return {"error", "no test data sets"};
    for (const auto& dir : c.data_sets) {
      auto set = kiln::tooling::read_test_data_set(dir, session);
      auto outputs = session.run(std::move(set.inputs));
      for (size_t k = 0; k < outputs.size(); ++k) {
        auto cmp = kiln::tooling::compare_values(outputs[k].value, set.outputs[k], c.rtol, c.atol);
        if (!cmp.ok) {
          return {"fail", fs::path(dir).filename().string() + " output '" + outputs[k].name +
                              "': " + cmp.message};
        }
      }
    }
    return {"pass", ""};
  } catch (const kiln::Error& e) {
    return {e.kind() == kiln::ErrorKind::Unsupported ? "unsupported" : "error", e.what()};
  } catch (const std::exception& e) {
    return {"error", std::string("exception: ") + e.what()};
  }
}

// Runs cases in forked children, `jobs` at a time.
std::vector<Result> run_all(const std::vector<Case>& cases, int jobs, int timeout_s, bool verbose) {
  std::vector<Result> results(cases.size());
  struct Child {
    pid_t pid;
    int fd;
    size_t index;
    std::string out;
    std::chrono::steady_clock::time_point start;
  };
  std::vector<Child> running;
  size_t next = 0;
  auto finish = [&](Child& ch, bool timed_out) {
    int status = 0;
    if (timed_out) kill(ch.pid, SIGKILL);
    waitpid(ch.pid, &status, 0);
    close(ch.fd);
    Result r;
    if (timed_out) {
      r = {"timeout", "did not finish in " + std::to_string(timeout_s) + " s"};
    } else if (WIFSIGNALED(status)) {
      r = {"crash", std::string("killed by signal ") + strsignal(WTERMSIG(status))};
    } else {
      const size_t tab = ch.out.find('\t');
      if (tab == std::string::npos) {
        r = {"crash",
             "exited without a result (status " + std::to_string(WEXITSTATUS(status)) + ")"};
      } else {
        r = {ch.out.substr(0, tab), one_line(ch.out.substr(tab + 1))};
      }
    }
    results[ch.index] = r;
    if (verbose || r.status != "pass") {
      std::cerr << cases[ch.index].id << ": " << r.status << (r.reason.empty() ? "" : " - ")
                << r.reason << "\n";
    }
  };
  while (next < cases.size() || !running.empty()) {
    while (next < cases.size() && static_cast<int>(running.size()) < jobs) {
      int fds[2];
      if (pipe(fds) != 0) {
        perror("pipe");
        std::exit(2);
      }
      const pid_t pid = fork();
      if (pid == 0) {
        close(fds[0]);
        const Result r = run_case(cases[next]);
        const std::string line = r.status + "\t" + r.reason;
        size_t off = 0;
        while (off < line.size()) {
          const ssize_t w = write(fds[1], line.data() + off, line.size() - off);
          if (w <= 0) break;
          off += static_cast<size_t>(w);
        }
        close(fds[1]);
        _exit(0);
      }
      close(fds[1]);
      running.push_back({pid, fds[0], next, "", std::chrono::steady_clock::now()});
      ++next;
    }
    std::vector<pollfd> pfds;
    for (const auto& ch : running) pfds.push_back({ch.fd, POLLIN, 0});
    poll(pfds.data(), pfds.size(), 200);
    for (size_t i = running.size(); i-- > 0;) {
      Child& ch = running[i];
      bool done = false;
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[4096];
        const ssize_t n = read(ch.fd, buf, sizeof buf);
        if (n > 0) {
          ch.out.append(buf, static_cast<size_t>(n));
        } else {
          done = true;
        }
      }
      const bool timed_out =
          !done && std::chrono::steady_clock::now() - ch.start > std::chrono::seconds(timeout_s);
      if (done || timed_out) {
        finish(ch, timed_out);
        running.erase(running.begin() + static_cast<long>(i));
      }
    }
  }
  return results;
}

std::set<std::string> read_list(const std::string& path) {
  std::set<std::string> out;
  std::ifstream in(path);
  if (!in) {
    std::cerr << "kiln-conformance: cannot read " << path << "\n";
    std::exit(2);
  }
  std::string line;
  while (std::getline(in, line)) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) out.insert(line);
  }
  return out;
}

// "case id | reason" lines (test/conformance/known_failures.txt).
std::map<std::string, std::string> read_reasons(const std::string& path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t bar = line.find(" | ");
    if (bar != std::string::npos) out[line.substr(0, bar)] = line.substr(bar + 3);
  }
  return out;
}

void write_report(const std::string& path, const std::vector<Case>& cases,
                  const std::vector<Result>& results, const std::string& command) {
  const auto reasons =
      read_reasons(std::string(KILN_SOURCE_DIR) + "/test/conformance/known_failures.txt");
  std::map<std::string, std::map<std::string, int>> counts;
  for (size_t i = 0; i < cases.size(); ++i) {
    ++counts[cases[i].folder][results[i].status];
    ++counts[cases[i].folder]["total"];
  }
  std::ofstream out(path);
  out << "# Conformance: the ONNX backend test cases\n\n"
      << "Generated by `" << command << "` (the `conformance-report` make target) from the\n"
      << "official ONNX backend test data. Outputs are compared as onnxruntime's runner does:\n"
      << "`|actual - expected| <= atol + rtol * |expected|` with rtol 1e-3 and atol 1e-5 (or the\n"
      << "case's own tolerances for `real/`), exact equality for integers, bools and strings, and\n"
      << "identical element types and shapes. `light/` models take all-zero inputs (their "
         "expected\n"
      << "outputs were computed that way); `real/` cases point at the same light models.\n\n"
      << "Every passing case is listed in `test/conformance/allowlist.txt`, which CI enforces.\n\n"
      << "| folder | cases | pass | fail | unsupported | error | crash | timeout |\n"
      << "|---|---|---|---|---|---|---|---|\n";
  std::map<std::string, int> total;
  for (const char* folder : kFolders) {
    auto& c = counts[folder];
    if (c["total"] == 0) continue;
    out << "| " << folder << " | " << c["total"] << " | " << c["pass"] << " | " << c["fail"]
        << " | " << c["unsupported"] << " | " << c["error"] << " | " << c["crash"] << " | "
        << c["timeout"] << " |\n";
    for (const auto& [k, v] : c) total[k] += v;
  }
  out << "| **all** | " << total["total"] << " | " << total["pass"] << " | " << total["fail"]
      << " | " << total["unsupported"] << " | " << total["error"] << " | " << total["crash"]
      << " | " << total["timeout"] << " |\n\n";
  // Sections kept by hand beside the tests that produce them: the Python harness's counts and
  // the files onnxruntime's transformer optimizer wrote.
  for (const char* part : {"python_backend.md", "ort_optimized.md"}) {
    if (std::ifstream in(std::string(KILN_SOURCE_DIR) + "/test/conformance/" + part); in)
      out << in.rdbuf();
  }
  out << "## Cases that do not pass\n\n| case | status | reason |\n|---|---|---|\n";
  for (size_t i = 0; i < cases.size(); ++i) {
    if (results[i].status == "pass") continue;
    auto known = reasons.find(cases[i].id);
    out << "| " << cases[i].id << " | " << results[i].status << " | "
        << one_line(known != reasons.end() ? known->second
                                           : "not yet explained: " + results[i].reason)
        << " |\n";
  }
  out << "\n";
  for (const char* folder : kFolders) {
    if (counts[folder]["total"] == 0) continue;
    out << "## " << folder << "\n\n| case | status | reason |\n|---|---|---|\n";
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].folder != folder) continue;
      std::string reason = one_line(results[i].reason);
      auto known = reasons.find(cases[i].id);
      if (known != reasons.end()) {
        reason = results[i].status == "pass" ? "passes now: remove it from known_failures.txt"
                                             : known->second + " (" + reason + ")";
      } else if (results[i].status != "pass") {
        reason = "not yet explained: " + reason;
      }
      out << "| " << cases[i].id.substr(cases[i].folder.size() + 1) << " | " << results[i].status
          << " | " << one_line(reason) << " |\n";
    }
    out << "\n";
  }
}

fs::path find_data(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("ONNX_BACKEND_TEST_DATA")) return env;
  const fs::path beside = fs::path(KILN_SOURCE_DIR) / ".." / "shared" / "onnx-backend-tests";
  if (fs::is_directory(beside)) return fs::canonical(beside);
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_flag, filter, report, write_allow, check_allow;
  int jobs = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  int timeout_s = 120;
  bool verbose = false;
  CLI::App app("Runs the official ONNX backend test cases and compares with their outputs.",
               "kiln-conformance");
  kiln::tooling::configure(app);
  app.add_option("--data", data_flag,
                 "the test data (default: $ONNX_BACKEND_TEST_DATA, or ../shared/onnx-backend-tests "
                 "beside the checkout)")
      ->type_name("DIR");
  app.add_option("--filter", filter, "only the cases whose id contains this text")
      ->type_name("TEXT");
  app.add_option("--report", report, "write a Markdown report to this file")->type_name("FILE");
  app.add_option("--write-allowlist", write_allow, "add the passing cases to this allow-list")
      ->type_name("FILE");
  app.add_option("--check-allowlist", check_allow,
                 "run only the listed cases; status 1 if one does not pass")
      ->type_name("FILE");
  kiln::tooling::add_int(app, "--jobs", jobs, 1, "cases run at once (default: one per core)");
  kiln::tooling::add_int(app, "--timeout", timeout_s, 1, "seconds per case (default 120)");
  app.add_flag("-v", verbose, "print every case");
  if (const auto status = kiln::tooling::parse_command_line(app, argc, argv)) return *status;
  // The command that made the report, for its header.
  std::string command = "kiln-conformance";
  if (!report.empty()) command += " --report " + fs::path(report).filename().string();
  if (!write_allow.empty())
    command += " --write-allowlist " + fs::path(write_allow).filename().string();
  const fs::path root = find_data(data_flag);
  if (root.empty() || !fs::is_directory(root / "node")) {
    std::cout << "kiln-conformance: SKIPPED: no ONNX backend test data (set ONNX_BACKEND_TEST_DATA "
                 "or put it in ../shared/onnx-backend-tests beside the checkout)\n";
    return kSkipped;
  }
  std::vector<Case> cases = discover(root);
  if (!check_allow.empty()) {
    const auto allow = read_list(check_allow);
    std::set<std::string> found;
    std::erase_if(cases, [&](const Case& c) { return !allow.count(c.id); });
    for (const auto& c : cases) found.insert(c.id);
    for (const auto& id : allow) {
      if (!found.count(id)) {
        std::cerr << "kiln-conformance: allow-listed case " << id << " is not in the test data\n";
        return 1;
      }
    }
  }
  if (!filter.empty()) {
    std::erase_if(cases, [&](const Case& c) { return c.id.find(filter) == std::string::npos; });
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Result> results = run_all(cases, jobs, timeout_s, verbose);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::map<std::string, int> by_status;
  for (const auto& r : results) ++by_status[r.status];
  std::cout << "kiln-conformance: " << cases.size() << " cases in " << secs << " s:";
  for (const auto& [status, n] : by_status) std::cout << " " << status << " " << n;
  std::cout << "\n";
  if (!report.empty()) write_report(report, cases, results, command);
  if (!write_allow.empty()) {
    // The list only grows: cases already listed stay listed (CI then reports them failing).
    std::set<std::string> listed;
    if (fs::exists(write_allow)) listed = read_list(write_allow);
    for (size_t i = 0; i < cases.size(); ++i) {
      if (results[i].status == "pass") listed.insert(cases[i].id);
    }
    std::ofstream out(write_allow);
    out << "# Conformance cases that must pass (kiln-conformance --check-allowlist). Only grows.\n";
    for (const auto& id : listed) out << id << "\n";
  }
  if (!check_allow.empty()) {
    int failed = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (results[i].status != "pass") ++failed;
    }
    if (failed > 0) {
      std::cerr << "kiln-conformance: " << failed << " allow-listed case(s) no longer pass\n";
      return 1;
    }
  }
  return 0;
}
